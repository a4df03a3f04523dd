"""Running the engine: build.py assembles one from an EngineConfig (`build_engine`, the one place
that does); the rest is process management, apart from the step itself (final/engine):

    process.py   the engine process the server and the shell talk to over ZMQ
    lifeline.py  how that process never outlives the frontend, nor blocks on it
    ranks.py     rank 0's handle on the other tensor-parallel ranks: start, watch, stop
    worker.py    one other rank's process: it runs the executor's step as rank 0 sends them
    node.py      another machine of a multi-node --tp: it starts and watches its ranks only
    watchdog.py  heartbeats and the watchdog that notices a lost rank
    heartbeat.py the engine process's pulse, so the frontend can tell it is alive and stepping
"""
