"""The papers' experiments reproduced on gpfl: accuracy, leakage, fairness, budgets, updates."""
