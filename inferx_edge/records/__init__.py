"""The on-disk records tuning leaves for builds: MetaSchedule databases and tensor-core tile records.

``tune`` writes them, ``compiler`` reads them; neither imports the other. Nothing here imports TVM at
load time.
"""
