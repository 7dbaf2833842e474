"""``serve``: the on-device runtime as an Open Inference Protocol v2 (KServe v2) server with dynamic
batching, the governor live, and Prometheus metrics; ``loadgen``, its MLPerf-style load generator.

Needs the ``serve`` extra (starlette, uvicorn, prometheus-client); imports the runtime, never the
compiler. Modules: protocol (wire format), shm (shared-memory regions), signature (a model's tensors,
request checks), batcher (queue, batches, devices), live (the governor in the server) with queueing
(its model), metrics, repository (models, versions, hot reload), app (HTTP), openapi, server (run and
drain), loadgen with client (its connections).
"""
