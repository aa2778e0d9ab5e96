"""The papers' learning systems, kept apart from the monitoring runtime (docs/learning.md).

* :mod:`.gd` — private gradient descent (Feldman & Zrnic, Algorithm 6) and private gradient
  descent with individual filtering (Algorithm 7), accounted by Propositions 5.1 / 5.2;
* :mod:`.dpsgd` — DP-SGD with Poisson sampling and Yu et al.'s individual privacy accounting;
* :mod:`.dpsgd_filter` — DP-SGD with one multi-order Rényi filter per example (Algorithm 3 with
  Remark 4.4), against plain DP-SGD at the same (ε, δ);
* :mod:`.reproduce`, :mod:`.individual_accounting` — the two papers' experiments at small scale
  (Feldman & Zrnic §5.1; Yu et al.'s individual ε of DP-SGD);
* :mod:`.commands` — the ``streamfilter learn ...`` subcommands.

Imports only ``streamfilter.privacy``, numpy, scipy and the standard library (scikit-learn
lazily, to load the bundled digits data). Nothing in the daemon, engine or client imports it.
"""
