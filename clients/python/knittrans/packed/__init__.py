"""The packed micro-batch: what the reorg sidecar's packer writes into shared memory and the trainer client
reads back (DESIGN.md §6). Pure and light (numpy only), so the packer loads neither the trainer client's gRPC
nor the store factory's config reader.
"""
