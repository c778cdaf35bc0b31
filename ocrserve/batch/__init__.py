"""``ocrserve batch``: offline OCR of many documents on Ray Data, resumable, each document once.

No gateway and no job store: a command takes files and folders, spreads their pages over a Ray
cluster (or a local Ray) and writes one result per document under ``--out``, with a manifest.

- :mod:`ocrserve.batch.output_folder`: what a run leaves behind: results written atomically, the done
  record of each result (its resume key), the manifest (one JSON line per document).
- :mod:`ocrserve.batch.ray_stages`: the work of each stage, free of Ray: inspect a document, decode
  a chunk of its pages (the gateway's preprocessor functions and limits), OCR pages in a worker
  holding an engine (``create_engine``, the gateway's), assemble a document's pages.
- :mod:`ocrserve.batch.ray_pipeline`: the stages on Ray Data (tasks for CPU work, an actor pool
  for the engine, retries), the progress bar and the run's summary.

Ray is imported only by :mod:`ocrserve.batch.ray_pipeline`, and only there (``pip install
'ocrserve[ray]'``).
"""
