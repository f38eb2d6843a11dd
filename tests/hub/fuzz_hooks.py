"""schemathesis hooks of tests/hub/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS):
what a fuzzed request makes on disk stays inside the test's sandbox folder. Commands run
in the workload's own folder under the hub's state folder (a temporary one); a training's
``checkpoint_dir`` is an absolute path the job runner creates, so it is moved under the
sandbox with its shape kept (a '..' in it is still refused by the hub)."""

import os

import schemathesis

SANDBOX = os.environ["GPUPOOL_FUZZ_SANDBOX"]


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("checkpoint_dir"), str) \
            and body["checkpoint_dir"].startswith("/"):
        body["checkpoint_dir"] = SANDBOX + body["checkpoint_dir"]
