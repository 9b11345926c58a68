"""The HTTP layer of serve.py (the root's command), shared by GRISP and the GRASP agent.

shared.py        what the routes share: bodies, 400/503, a job as one answer or as Server-Sent Events
jobs.py          the bounded job queue and the one worker thread
agent_routes.py  the page's agent mode: /api/agent/stream and /api/agent/cancel
openai_api.py    /v1/chat/completions (streaming too) and /v1/models over our model
web/static/          the web page (HTML, JS, CSS; no build step, no network)
"""
