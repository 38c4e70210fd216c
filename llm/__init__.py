"""Masked diffusion language model: tokenizer, model loading, block decoder, training."""
