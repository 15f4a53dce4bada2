"""Hard negatives: an ANN index over classifier rows (or label embeddings), mined for every
training query, refreshed on the schedule of the paper's Algorithm 1."""
