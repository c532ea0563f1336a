"""The server: the Starlette app (`app`), its routes (`realtime_routes`, `realtime_ws`,
`video_ws`), origin checks (`origins`), settings, the embedded Redis (`redis_server`) and
the `parley` command line (`cli`)."""
