PROGS_common := tokenize
