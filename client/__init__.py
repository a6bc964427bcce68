"""gpfl client: the device's code.

The Flower NumPyClient and its ClientApp (hypothesis choice, local training, sanitizing and the
privacy budget), and the device's runner around Flower's SuperNode (``gpfl supernode``, its
executor, its idle poll and its CPU pinning), and the view of a device's ledger.
"""
