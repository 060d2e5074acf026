"""The console's side of a campaign: launching its nodes, rolling their figures up, and asking
one node for the queue's own state (its chunks, commits and given-back records in S3), its
proof and its retries. The queue's truth lives in S3; nothing here keeps state."""
