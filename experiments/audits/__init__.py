"""Privacy audits and attacks on gpfl's releases, each with its section of the report.

Gradient inversion (the DLG audit), empirical lower bounds on ε, membership inference, the low
bits of a release, and rogue devices.
"""
