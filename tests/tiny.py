"""Small, fast options shared by the tests that run whole evaluations."""
TINY_INVENTORY = {"search_periods": 300, "heldout_periods": 300, "warmup": 50, "search_trajectories": 2,
                  "heldout_trajectories": 2, "tune_trials": 8, "tune_batch": 4}
