"""From logits to what a client reads: sampling, structured-output masks, stop checks and
detokenization.
"""
