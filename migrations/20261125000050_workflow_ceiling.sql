-- The rights of whoever started a workflow execution, kept with it so that every agent its
-- states start acts under them too (on any replica, after any restart): the starter's tier and
-- the names of the security contexts that confined it. NULL: started by an operator without a
-- context, or by the node itself (schedules), so no ceiling applies.
ALTER TABLE workflow_executions ADD COLUMN ceiling JSONB;
