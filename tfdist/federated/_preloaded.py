"""The last module the federated pool's fork server imports (``FORKSERVER_PRELOAD``): freezes what came before.

Importing it collects garbage once and moves every object that exists to
the collector's permanent generation (``gc.freeze``), as
``tfdist.cluster.zygote`` does before it forks tasks: a forked worker's full
collections then skip TensorFlow's and Keras's hundreds of thousands of
module objects, and never write to the pages it shares with the fork server.
Nothing else imports it.
"""

import gc

gc.collect()
gc.freeze()
