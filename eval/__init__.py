"""eval: measure what verbatim-n-gram filtering does not cover (approximate memorization, exposure)."""
