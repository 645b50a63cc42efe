"""Use cases without Dagster: coordinate (observe and plan), run a pipeline on a batch,
finalize. The sensors, the assets, the headless runner and the command line call these."""
