"""The benchmark harness of issue 13: gatewrap against its peers, side by side in one run.

``bench/run`` runs it (see bench/README.md); each module measures one section and returns
a JSON-able dict; ``report`` turns them into bench/results/latest.{md,json}.
"""
