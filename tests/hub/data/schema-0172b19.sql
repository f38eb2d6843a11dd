PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE departments (
	name VARCHAR(63) NOT NULL, 
	gpus FLOAT NOT NULL, 
	over_quota_weight FLOAT NOT NULL, 
	"limit" FLOAT, 
	PRIMARY KEY (name)
);
INSERT INTO departments VALUES('research',4.0,1.0,NULL);
CREATE TABLE nodes (
	name VARCHAR(255) NOT NULL, 
	pool VARCHAR(63) NOT NULL, 
	gpus JSON NOT NULL, 
	cpu_milli INTEGER NOT NULL, 
	memory_mib INTEGER NOT NULL, 
	source VARCHAR(16) NOT NULL, 
	PRIMARY KEY (name)
);
CREATE TABLE workloads (
	name VARCHAR(255) NOT NULL, 
	owner VARCHAR(255) NOT NULL, 
	project VARCHAR(63) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	spec JSON NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	placement JSON NOT NULL, 
	over_quota BOOLEAN NOT NULL, 
	reason TEXT NOT NULL, 
	queue_position INTEGER NOT NULL, 
	submit_time FLOAT NOT NULL, 
	start_time FLOAT, 
	pid INTEGER, 
	server VARCHAR(255) NOT NULL, 
	PRIMARY KEY (name)
);
INSERT INTO workloads VALUES('alice-ws','alice','nlp','workspace','{"gpus": 1}','stopped','[]',0,'',0,1000000000.0,NULL,NULL,'');
CREATE TABLE events (
	id INTEGER NOT NULL, 
	ts FLOAT NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	workload VARCHAR(255) NOT NULL, 
	project VARCHAR(63) NOT NULL, 
	message TEXT NOT NULL, 
	user VARCHAR(255), 
	department VARCHAR(63), 
	gpus FLOAT, 
	placement JSON, 
	PRIMARY KEY (id)
);
INSERT INTO events VALUES(1,1000000000.0,'submitted','alice-ws','nlp','alice submitted alice-ws','alice','research',1.0,NULL);
CREATE TABLE samples (
	ts FLOAT NOT NULL, 
	capacity_milli INTEGER NOT NULL, 
	allocated_milli INTEGER NOT NULL, 
	utilization_pct FLOAT, 
	PRIMARY KEY (ts)
);
CREATE TABLE gpu_samples (
	ts FLOAT NOT NULL, 
	node VARCHAR(255) NOT NULL, 
	gpu_index INTEGER NOT NULL, 
	utilization_pct FLOAT NOT NULL, 
	PRIMARY KEY (ts, node, gpu_index)
);
CREATE TABLE meta (
	"key" VARCHAR(63) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO meta VALUES('version','3');
CREATE TABLE role_assignments (
	user VARCHAR(255) NOT NULL, 
	role VARCHAR(32) NOT NULL, 
	department VARCHAR(63) NOT NULL, 
	source VARCHAR(16) NOT NULL, 
	PRIMARY KEY (user, role, department)
);
INSERT INTO role_assignments VALUES('bob','viewer','research','api');
CREATE TABLE audit_log (
	id INTEGER NOT NULL, 
	ts FLOAT NOT NULL, 
	actor VARCHAR(255) NOT NULL, 
	action VARCHAR(63) NOT NULL, 
	project VARCHAR(63) NOT NULL, 
	target VARCHAR(255) NOT NULL, 
	details JSON NOT NULL, 
	PRIMARY KEY (id)
);
CREATE TABLE trainings (
	name VARCHAR(63) NOT NULL, 
	owner VARCHAR(255) NOT NULL, 
	project VARCHAR(63) NOT NULL, 
	spec JSON NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	reason TEXT NOT NULL, 
	request VARCHAR(16) NOT NULL, 
	attempt INTEGER NOT NULL, 
	failures INTEGER NOT NULL, 
	preemptions INTEGER NOT NULL, 
	created FLOAT NOT NULL, 
	updated FLOAT NOT NULL, 
	transitions JSON NOT NULL, 
	PRIMARY KEY (name)
);
INSERT INTO trainings VALUES('bert','alice','nlp','{"name": "bert"}','Succeeded','','',0,0,0,1000000000.0,1000000000.0,'[]');
CREATE TABLE inference_services (
	name VARCHAR(63) NOT NULL, 
	owner VARCHAR(255) NOT NULL, 
	project VARCHAR(63) NOT NULL, 
	spec JSON NOT NULL, 
	created FLOAT NOT NULL, 
	status JSON NOT NULL, 
	PRIMARY KEY (name)
);
CREATE TABLE projects (
	name VARCHAR(63) NOT NULL, 
	department VARCHAR(63) NOT NULL, 
	gpus FLOAT NOT NULL, 
	over_quota_weight FLOAT NOT NULL, 
	"limit" FLOAT, 
	PRIMARY KEY (name), 
	FOREIGN KEY(department) REFERENCES departments (name)
);
INSERT INTO projects VALUES('nlp','research',2.0,1.0,NULL);
CREATE TABLE members (
	project VARCHAR(63) NOT NULL, 
	user VARCHAR(255) NOT NULL, 
	PRIMARY KEY (project, user), 
	FOREIGN KEY(project) REFERENCES projects (name) ON DELETE CASCADE
);
INSERT INTO members VALUES('nlp','alice');
CREATE TABLE credentials (
	project VARCHAR(63) NOT NULL, 
	name VARCHAR(50) NOT NULL, 
	delivery VARCHAR(8) NOT NULL, 
	keys JSON NOT NULL, 
	sealed TEXT NOT NULL, 
	description TEXT NOT NULL, 
	created_by VARCHAR(255) NOT NULL, 
	created FLOAT NOT NULL, 
	updated FLOAT NOT NULL, 
	PRIMARY KEY (project, name), 
	FOREIGN KEY(project) REFERENCES projects (name) ON DELETE CASCADE
);
CREATE TABLE data_sources (
	project VARCHAR(63) NOT NULL, 
	name VARCHAR(50) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	spec JSON NOT NULL, 
	mount_path TEXT NOT NULL, 
	read_only BOOLEAN NOT NULL, 
	description TEXT NOT NULL, 
	created_by VARCHAR(255) NOT NULL, 
	created FLOAT NOT NULL, 
	PRIMARY KEY (project, name), 
	FOREIGN KEY(project) REFERENCES projects (name) ON DELETE CASCADE
);
CREATE INDEX ix_workloads_project ON workloads (project);
CREATE INDEX ix_workloads_owner ON workloads (owner);
CREATE INDEX ix_workloads_state ON workloads (state);
CREATE INDEX ix_events_workload ON events (workload);
CREATE INDEX ix_events_project ON events (project);
CREATE INDEX ix_events_ts ON events (ts);
CREATE INDEX ix_events_user ON events (user);
CREATE INDEX ix_role_assignments_user ON role_assignments (user);
CREATE INDEX ix_audit_log_ts ON audit_log (ts);
CREATE INDEX ix_audit_log_actor ON audit_log (actor);
CREATE INDEX ix_audit_log_project ON audit_log (project);
CREATE INDEX ix_audit_log_action ON audit_log (action);
CREATE INDEX ix_trainings_owner ON trainings (owner);
CREATE INDEX ix_trainings_status ON trainings (status);
CREATE INDEX ix_trainings_project ON trainings (project);
CREATE INDEX ix_inference_services_owner ON inference_services (owner);
CREATE INDEX ix_inference_services_project ON inference_services (project);
CREATE INDEX ix_projects_department ON projects (department);
CREATE INDEX ix_members_user ON members (user);
COMMIT;
