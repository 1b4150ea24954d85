"""`make demo`: the whole routing path on loopback, driven through a short storyline (`python -m demo`).

Starts a real LMCache controller, three simulated vLLM engines, the loadaware sidecar and a real Envoy
(testkit.stack.Stack), sends traffic through Envoy at :10000 and, for every step, prints where the request
went and why, from the sidecar's own record of the decision (GET /debug/decisions): per engine the matched /
prompt tokens, the load and the score of

    score(i) = min(1, matched(i) / prompt) - beta * (load(i) - mean_load) / max(1, mean_load)

Every step checks what it claims. A failed check prints `FAIL: ...`; the run then ends with `DEMO FAILED`
and exit code 1, otherwise with `DEMO OK` and exit code 0, so tests can rely on the output. Everything is
stopped on exit, Ctrl-C and SIGTERM included; process logs go to out/demo/logs. Step 7 puts a second Envoy
(envoy/envoy-inference-pool.yaml, the Endpoint Picker Protocol's FULL_DUPLEX_STREAMED mode, :10001) in front of
the same sidecar and engines, and shows a retry walking the sidecar's ranked list. It closes with a short
real-time run of the reference experiment (experiment/realtime/demo_run.py). Before that, when the vLLM venv
exists (`make .vllm-venv/.installed`; `--no-vllm` skips it) and the steps passed, the same decisions against two
real vLLM engines (demo/real_vllm.py).

Modules: `startup` (the stack on the fixed addresses), `session` (requests, decisions, checks), `prompts`,
`explain` (a decision's table and why), `storyline` (steps 1-5), `burst` (step 6 and the run's accounting),
`picker` (step 7), `agentic` (step 10: a Responses follow-up on its holder, Messages by prefix),
`walkthrough` (all steps against a running stack), `real_vllm`, `short_experiment`, `__main__`
(the CLI).
"""
