"""Close the loop against a running server: `evolve replay`, `evolve profile`, `evolve validate`.

replay.py   program-causal load generator (Eq. 2 releases, token-id prompts with shared prefixes)
profile.py  black-box step-time profile of a server -> a measured profile directory
validate.py replay + simulate the same workload, the paper's validation table and plots
client.py   the async OpenAI-compatible streaming client; exported.py an `evolve export` package
"""
