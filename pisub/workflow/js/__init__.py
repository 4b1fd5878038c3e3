"""JavaScript workflow scripts: the seed's language, run by an embedded QuickJS engine
(:mod:`pisub.workflow.js.engine`) and checked statically (:mod:`pisub.workflow.js.checks`)."""
