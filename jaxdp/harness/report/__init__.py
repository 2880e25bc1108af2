"""The `jaxdp compare` report: run (runner), project (projection), draw (plots), write (render)."""
