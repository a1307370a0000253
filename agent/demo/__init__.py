"""`medic demo`: a small fleet of real onnxruntime inference servers, one agent watching them with
compressed detection windows in enforce mode, and a narration of what it finds and does.

    model.py      the tiny ONNX model, built with the `onnx` helper API into the demo's state dir
    server.py     one inference server (`python -m agent.demo.server`), with a behaviour
    behaviours.py healthy, leak, slow: what differs between the servers
    load.py       the load generator: steady prediction requests to every server
    config.py     the demo's settings and the compressed medic config it runs
    fleet.py      the agent process, start and cleanup
    report.py     the closing table or JSON report
    narrate.py    events, findings and the plan as one line each, for people
"""
