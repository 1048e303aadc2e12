"""The verification pass and what it runs on: the tree pass and its batch form, the slab KV
cache, the host buffers, the attention contexts, the linear layouts and the prompt's
seeding rows. It imports the adapters and `recap.state`, nothing of decoding."""
