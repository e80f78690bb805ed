"""The fault campaign (``make chaos``): every scenario several times with randomized kill points, counted
by an independent consumer."""
