"""Where a run's processes go and what they cost, with no GPU needed to ask: the components and their GPUs
(:mod:`.placement`), the colocated layouts' phases (:mod:`.colocate`, their log :mod:`.phases`), the topology record
of what actually ran (:mod:`.topology`), the watch on Ray's nodes (:mod:`.nodes`), the device and dtype resolved
(:mod:`.device`), the memory plan ``marti-ibrl plan`` prints (:mod:`.plan`) and the layouts that fit (:mod:`.layouts`).
docs/cluster.md tells the story; the processes themselves are started by :mod:`marti_ibrl.backend`."""
