"""The model side: a stage graph turns one `PipelineRequest` into streamed output chunks.

What it offers the rest of Parley:
- `types`: the engine contract (`EntryEngine`, `StreamEngine`), the request and the typed
  chunks (text, hidden states, codec codes, audio, end, error), the audio format constants.
- `graph.StageGraph` / `engine_pipeline.EnginePipeline`: a pipeline to `generate` from, built
  by `registry.build_pipeline` from a graph file (`graph_config`, shipped ones in `configs/`).
- `worker` / `remote`: a stage in a worker process (shared-memory link) or on another host
  (Redis-streams link), behind the same engine contract; `link_messages` is their protocol.
- `engines/`: `cascade` (the embedded CPU default), `qwen3_omni`, `echo`.
- `tasks.cancel_and_wait`: the one way an owner stops a task it started.
Nothing here knows about sessions or transports.
"""
