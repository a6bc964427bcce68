"""Benchmarks: what gpfl's parts and rounds cost against Flower's own and against floors."""
