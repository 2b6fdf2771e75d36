"""Long-form work: batches of speech requests answered as one ZIP, and book-length jobs that are
stored segment by segment as they finish and survive a restart (see `runner`)."""
