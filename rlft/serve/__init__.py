"""``rlft serve POLICY``: a saved policy behind the OpenAI Chat Completions API.

:mod:`rlft.serve.core` is the plain part, without HTTP: a request's JSON body in, a response in OpenAI's shape and
a record of the tokens (prompt ids as rendered, sampled ids, their log-probs) out. :mod:`rlft.serve.http` is the
thin shell on FastAPI + uvicorn around it (the ``serve`` extra).
"""
