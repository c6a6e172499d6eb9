"""Reading what a training run left behind: its log (``logs``), why it ran out of memory
(``oom``), why it is slow (``performance``), what changed between two runs (``regression``),
whether a node is ready (``preflight``), and the cluster's real speed (``calibrate``)."""
