"""VoxMux: a model-multiplexing, OpenAI-compatible text-to-speech gateway (see README.md)."""
