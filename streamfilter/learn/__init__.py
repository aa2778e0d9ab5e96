"""The papers' learning systems, kept apart from the monitoring runtime.

* :mod:`.gd` — private gradient descent (Feldman & Zrnic, Algorithm 6) and private gradient
  descent with individual filtering (Algorithm 7), accounted by Propositions 5.1 / 5.2;
* :mod:`.dpsgd` — DP-SGD with Poisson sampling and Yu et al.'s individual privacy accounting;
* :mod:`.reproduce`, :mod:`.individual` — the two papers' experiments at small scale;
* :mod:`.commands` — the ``streamfilter learn ...`` subcommands.

Imports only ``streamfilter.privacy``, numpy, scipy and the standard library (scikit-learn
lazily, to load the bundled digits data). Nothing in the daemon, engine or client imports it.
"""
