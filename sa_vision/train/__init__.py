""" Training: data, the training loop with timm's parts, checkpoints, evaluation and recipes (paper App. A.4) """
