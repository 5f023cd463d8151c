"""graphcost.analyzer: the IR, the frontends, the API, the command line and the renderers.

    from graphcost import analyze
"""
