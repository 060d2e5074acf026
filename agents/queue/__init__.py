"""One queue for many nodes: a campaign's work cut into chunks, leased and committed through
S3's own conditional writes. Leases are for efficiency (who works on what); commits are for
correctness (the first commit of a chunk is the one that counts). The truth lives in the
campaign's S3 prefix, so no console and no node is needed to keep it."""
