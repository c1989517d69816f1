"""``kcops report``: one self-contained HTML page of PNG plots from a running agent.

``timeline`` reads the agent's query API and audit log into series on one
time grid; ``plots`` draws them with matplotlib (the ``viz`` extra); ``page``
writes the HTML with the images inline, so it opens with no network.
"""
