"""Acceptance gates: the caller's ``acceptance`` / ``gate`` checked (:mod:`.spec`), and the
``verify`` commands run on the child's tree after it ends, memoized per tree state
(:mod:`.verify`)."""
