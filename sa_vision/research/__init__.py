""" Research tools: attention analysis, head pruning (paper App. A.1), Theorem 1 made executable (Sec. 3), figures,
and the paper's own dense formulation as a reference """
