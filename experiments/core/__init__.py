"""What every experiment shares: the loop, the context, rows, figures, claims and the report.

Reproductions, audits and benchmarks import it; it imports none of them (`registry` names
their modules, loaded by name when a command asks for one).
"""
