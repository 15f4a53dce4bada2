"""The query encoders: the architecture registry (architectures; add an encoder
there), the BERT encoder and the n-gram bag, their configs, pretrained weights, the factory
that builds the configured one, and E(x) over token rows outside the train step (embedding).

Layer 3 of 13: may import runtime, data.
"""
