"""bloom_builder: stream a corpus of any size into one memfree filter file (map/reduce, resumable)."""
