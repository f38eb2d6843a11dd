"""``gpupool inference``: what each subcommand sends to the REST API."""

from hub_ext.cli import parser


def run(argv, answer):
    calls = []

    def api(args, method, path, body=None):
        calls.append((method, path, body))
        return answer

    import hub_ext.serving.cli as icli

    p = parser()
    # re-register with our fake API (the real one calls the hub)
    sub = next(a for a in p._actions if a.dest == "cmd")
    sub.choices.pop("inference")
    icli.add_parser(sub, api)
    args = p.parse_args(argv)
    args.fn(args)
    return calls


def test_submit_sends_the_spec(capsys):
    calls = run(["inference", "submit", "llm", "--project", "p", "--gpu", "0.25",
                 "--min-replicas", "0", "--max-replicas", "4", "--metric", "concurrency",
                 "--target", "10", "--scale-to-zero-after", "300", "--port", "8000", "--",
                 "python", "serve.py", "--port", "{port}"],
                {"name": "llm", "project": "p", "url": "/services/gpupool-serve/llm/"})
    method, path, body = calls[0]
    assert (method, path) == ("POST", "/inferences")
    assert body == {"name": "llm", "command": ["python", "serve.py", "--port", "{port}"],
                    "project": "p", "gpu": 0.25, "min_replicas": 0, "max_replicas": 4,
                    "metric": "concurrency", "target": 10.0, "scale_to_zero_after_s": 300.0,
                    "port": 8000}
    assert "/services/gpupool-serve/llm/" in capsys.readouterr().out


def test_list_describe_delete(capsys):
    svc = {"name": "llm", "project": "p", "owner": "a", "url": "/u/", "ready": 0, "replicas": 1,
           "desired": 1, "spec": {"gpu": 1, "min_replicas": 0, "max_replicas": 2, "public": False,
                                  "metric": "concurrency", "target": 1, "stable_window_s": 60,
                                  "scale_to_zero_after_s": 300, "command": ["x"]},
           "status": {"why": "activating", "replica_list": [
               {"name": "llm-1", "state": "pending", "placement": "",
                "reason": "project p is at its quota"}]}}
    assert run(["inference", "list"], {"items": [svc]})[0][:2] == ("GET", "/inferences")
    assert run(["inference", "describe", "llm"], svc)[0][:2] == ("GET", "/inferences/llm")
    assert "project p is at its quota" in capsys.readouterr().out
    assert run(["inference", "delete", "llm"], {})[0][:2] == ("DELETE", "/inferences/llm")
