"""Trace-driven simulation of gpupool's scheduler pieces (``gpupool-sim``).

``trace`` loads the Alibaba openb CSVs into model objects; ``placement`` replays the FGD
paper's placement protocol; ``cli`` is the console entry point with one subcommand per
experiment.
"""
