from app.cli import entry

entry()
