"""gpfl client: the Flower NumPyClient and its ClientApp.

Hypothesis choice, local training, sanitizing and the privacy budget.
"""
