-- upgrade_v25.sqlite.sql with its blobs and types in PostgreSQL's spelling
-- (X'..' -> '\x..', BLOB -> BYTEA); see store_upgrade_test.go.
BEGIN TRANSACTION;
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY);
INSERT INTO schema_migrations VALUES(1);
INSERT INTO schema_migrations VALUES(2);
INSERT INTO schema_migrations VALUES(3);
INSERT INTO schema_migrations VALUES(4);
INSERT INTO schema_migrations VALUES(5);
INSERT INTO schema_migrations VALUES(6);
INSERT INTO schema_migrations VALUES(9);
INSERT INTO schema_migrations VALUES(10);
INSERT INTO schema_migrations VALUES(11);
INSERT INTO schema_migrations VALUES(12);
INSERT INTO schema_migrations VALUES(13);
INSERT INTO schema_migrations VALUES(25);
CREATE TABLE tenants (
  id          TEXT PRIMARY KEY,
  parent_id   TEXT,
  name        TEXT NOT NULL,
  state       TEXT NOT NULL,
  created_at  BIGINT NOT NULL
);
INSERT INTO tenants VALUES('root',NULL,'root','active',0);
INSERT INTO tenants VALUES('tgurff5k2meuxkmr7','root','acme','active',1796146109408);
CREATE TABLE api_keys (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  identity    TEXT NOT NULL,
  name        TEXT NOT NULL,
  hash        BYTEA NOT NULL UNIQUE,
  scopes      TEXT NOT NULL DEFAULT '',
  created_at  BIGINT NOT NULL,
  expires_at  BIGINT,
  revoked_at  BIGINT
, made_by TEXT);
INSERT INTO api_keys VALUES('kh3jg4ynwovckdg3b','root','admin','dev admin','\x6422ce75e0f4b4f8c94dca10da378e547498921098e5ffa61b588b02484c7fd7','',1796146091611,NULL,NULL,NULL);
CREATE TABLE join_tokens (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  hash        BYTEA NOT NULL UNIQUE,
  role        TEXT NOT NULL,
  name        TEXT NOT NULL DEFAULT '',
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  expires_at  BIGINT NOT NULL,
  used_at     BIGINT,
  node_id     TEXT
);
INSERT INTO join_tokens VALUES('jt_wcriz5f7jjo7tr4z','root','\xe6aaf56f99b6467d0bd068d83eb67c8218d71440658387b22f026b09d1888f8c','node','sim-0','dev',1796146091613,1796146691613,1796146091622,'n43iepgrtnocnclou');
INSERT INTO join_tokens VALUES('jt_yunveaout274geyd','root','\xd3da631dc6cd4e8df39cc4d8ee3108c5715e35dd3f3da7e35ddcb640bb3f459f','node','sim-1','dev',1796146091630,1796146691630,1796146091635,'nwvpkwufjw4jj64hq');
CREATE TABLE nodes (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL REFERENCES tenants(id),
  name         TEXT NOT NULL,
  role         TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  labels       TEXT NOT NULL DEFAULT '{}',
  inventory    TEXT NOT NULL DEFAULT '{}',
  version      TEXT NOT NULL DEFAULT '',
  boot_id      TEXT NOT NULL DEFAULT '',
  last_seen_at BIGINT
);
INSERT INTO nodes VALUES('n43iepgrtnocnclou','root','sim-0','node',1796146091622,'{"runtime.sandbox.memory_mb":"4096","runtime.sandbox.slots":"32","runtime.sim":"true","sim":"true"}','{"driver":"sim","hostname":"sim-0","cpus":64,"memory_bytes":549755813888,"gpus":[{"id":"gpu0","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu1","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu2","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu3","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu4","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu5","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu6","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu7","model":"SIM-H100","memory_bytes":85899345920}],"disks":[{"id":"nvme0n1","model":"SIM-NVME","size_bytes":4398046511104},{"id":"nvme1n1","model":"SIM-NVME","size_bytes":4398046511104}]}','0.1.0','bt20cf2dd768364fb31d80',1796146113041);
INSERT INTO nodes VALUES('nwvpkwufjw4jj64hq','root','sim-1','node',1796146091635,'{"runtime.sandbox.memory_mb":"4096","runtime.sandbox.slots":"32","runtime.sim":"true","sim":"true"}','{"driver":"sim","hostname":"sim-1","cpus":64,"memory_bytes":549755813888,"gpus":[{"id":"gpu0","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu1","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu2","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu3","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu4","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu5","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu6","model":"SIM-H100","memory_bytes":85899345920},{"id":"gpu7","model":"SIM-H100","memory_bytes":85899345920}],"disks":[{"id":"nvme0n1","model":"SIM-NVME","size_bytes":4398046511104},{"id":"nvme1n1","model":"SIM-NVME","size_bytes":4398046511104}]}','0.1.0','btab8269fa5994266f28e9',1796146113041);
CREATE TABLE node_certs (
  serial        TEXT PRIMARY KEY,
  node_id       TEXT NOT NULL REFERENCES nodes(id),
  role          TEXT NOT NULL,
  cert_der      BYTEA NOT NULL,
  not_before    BIGINT NOT NULL,
  not_after     BIGINT NOT NULL,
  allowed_kinds TEXT,
  created_at    BIGINT NOT NULL,
  revoked_at    BIGINT,
  revoke_reason TEXT
, renewed_from TEXT);
INSERT INTO node_certs VALUES('c402b3b8b1f30697bf6ea7be2501e745','n43iepgrtnocnclou','node','\x30820211308201b7a003020102021100c402b3b8b1f30697bf6ea7be2501e745300a06082a8648ce3d040302304f31153013060355040a130c6465762e62632e6c6f63616c31153013060355040b130c6465762e62632e6c6f63616c311f301d0603550403131642657474657220436f6d70757465206e6f6465204341301e170d3236313230313137323731315a170d3236313230323137323831315a301c311a3018060355040313116e34336965706772746e6f636e636c6f753059301306072a8648ce3d020106082a8648ce3d03010703420004d9c35a05294ff593bde44415c67d53e839df638a8e4405e1eebba782863a4d48fd95e29775ae239a219a179ff8c7026c0eb33fb25a7121c920ad36558c220b00a381a63081a3300e0603551d0f0101ff04040302078030130603551d25040c300a06082b06010505070302300c0603551d130101ff04023000301f0603551d230418301680145cff6ff88856d9bf8cb6174e8796ade8a9222ca130370603551d110430302e862c7370696666653a2f2f6465762e62632e6c6f63616c2f6e6f64652f6e34336965706772746e6f636e636c6f753014060a2b0601040183d45f010104060c046e6f6465300a06082a8648ce3d0403020348003045022100e5ccba61a467e3cb03a6ba34a9188e5fbbf2626fab6072f3e17d80c50912e2c202203b6a48d95c2e37903643337d48234b41da61b9edf40bac5b5a4ce80fb056f87f',1796146031000,1796232491000,NULL,1796146091622,NULL,NULL,NULL);
INSERT INTO node_certs VALUES('a8d1e6992ac269399c9a890542e28d1f','nwvpkwufjw4jj64hq','node','\x30820210308201b7a003020102021100a8d1e6992ac269399c9a890542e28d1f300a06082a8648ce3d040302304f31153013060355040a130c6465762e62632e6c6f63616c31153013060355040b130c6465762e62632e6c6f63616c311f301d0603550403131642657474657220436f6d70757465206e6f6465204341301e170d3236313230313137323731315a170d3236313230323137323831315a301c311a3018060355040313116e7776706b7775666a77346a6a363468713059301306072a8648ce3d020106082a8648ce3d03010703420004915a93605508127ee8d8d760b5a81054640caa80138dc1016e405de19420e947caa7df535b9d6277754aaa29b184a14abd0960e9b0a3711929764a428502898ba381a63081a3300e0603551d0f0101ff04040302078030130603551d25040c300a06082b06010505070302300c0603551d130101ff04023000301f0603551d230418301680145cff6ff88856d9bf8cb6174e8796ade8a9222ca130370603551d110430302e862c7370696666653a2f2f6465762e62632e6c6f63616c2f6e6f64652f6e7776706b7775666a77346a6a363468713014060a2b0601040183d45f010104060c046e6f6465300a06082a8648ce3d04030203470030440220159a0513b83108607ea4781c8b8a40ea66da52af335d04f05ab204f0cceba97302205b4d65be50a275edf94bcbde1c5f210c072d6ac87d338a9cf3607e31f788211b',1796146031000,1796232491000,NULL,1796146091635,NULL,NULL,NULL);
CREATE TABLE node_sessions (
  node_id      TEXT PRIMARY KEY REFERENCES nodes(id),
  session_id   TEXT NOT NULL,
  gateway_id   TEXT NOT NULL,
  boot_id      TEXT NOT NULL,
  cert_serial  TEXT NOT NULL,
  connected_at BIGINT NOT NULL,
  closed_at    BIGINT
, heartbeat_at BIGINT);
INSERT INTO node_sessions VALUES('n43iepgrtnocnclou','sdpt4duieyojpjaog','gw-vm-127.0.0.1:17781','bt20cf2dd768364fb31d80','c402b3b8b1f30697bf6ea7be2501e745',1796146091634,1796146113041,1796146111612);
INSERT INTO node_sessions VALUES('nwvpkwufjw4jj64hq','siyezhil7a3a7qjkf','gw-vm-127.0.0.1:17781','btab8269fa5994266f28e9','a8d1e6992ac269399c9a890542e28d1f',1796146091650,1796146113041,1796146111612);
CREATE TABLE session_flips (
  id          TEXT PRIMARY KEY,
  cert_serial TEXT NOT NULL,
  node_id     TEXT NOT NULL,
  from_boot   TEXT NOT NULL,
  to_boot     TEXT NOT NULL,
  at          BIGINT NOT NULL
);
CREATE TABLE worker_keys (
  id          TEXT PRIMARY KEY,
  cert_der    BYTEA NOT NULL,
  sealed_key  BYTEA NOT NULL,
  not_after   BIGINT NOT NULL,
  created_at  BIGINT NOT NULL
);
INSERT INTO worker_keys VALUES('wkz4wulchcj5wkc5se','\x308201b330820165a003020102021073132aff2e12ab64be119ab9bd085d9c300506032b6570305431153013060355040a130c6465762e62632e6c6f63616c31153013060355040b130c6465762e62632e6c6f63616c312430220603550403131b42657474657220436f6d7075746520636f6d6d616e6420726f6f74301e170d3236313230313137323731315a170d3236313230323137323831315a30243122302006035504031319776f726b657220776b7a3477756c6368636a35776b63357365302a300506032b65700321002e427c90b2b1ffed54e57eec375e469cb017e163fc0268a146c397f26ce7db95a37d307b300e0603551d0f0101ff040403020780300c0603551d130101ff04023000301f0603551d2304183016801413db5b41b7ec0d71e467753bea848d7ed0ad3f43303a0603551d1104333031862f7370696666653a2f2f6465762e62632e6c6f63616c2f776f726b65722f776b7a3477756c6368636a35776b63357365300506032b6570034100c3ea179bc14a4a53adb31d58406814928d6a29cc7b35475d0ec174c2f3d7572f80195de136ca37da64f7be19ef24c6b523fa9fccf2051d933b6b344e1bbcc40f','\x017b3adaf1aec9429c16c95b4cfe270491281dc5d5a423c2f5bda24d0693e7cc52c851ff488752aa7e6f1c15acad5b2f18c9c7b06d5332ef145f7ba1f9dbac9c235bebb4a163b28cb2c79ba857e13847278fa7bf7a289fdf13ea7dfa87',1796232491609,1796146091609);
CREATE TABLE commands (
  id                 TEXT PRIMARY KEY,
  tenant_id          TEXT NOT NULL REFERENCES tenants(id),
  node_id            TEXT NOT NULL,
  kind               TEXT NOT NULL,
  payload            BYTEA NOT NULL,
  state              TEXT NOT NULL,
  reason             TEXT NOT NULL DEFAULT '',
  result             BYTEA,
  attested           INTEGER NOT NULL DEFAULT 0,
  created_by         TEXT NOT NULL,
  created_at         BIGINT NOT NULL,
  updated_at         BIGINT NOT NULL,
  expires_at         BIGINT NOT NULL,
  body               BYTEA,
  signature          BYTEA,
  signer_cert        BYTEA,
  update_body        BYTEA,
  node_sig           BYTEA,
  update_cert_serial TEXT
, batch_id TEXT);
INSERT INTO commands VALUES('cjqwkpux5n4lrdkiw','root','n43iepgrtnocnclou','diag.run','\x7b7d','succeeded','','\x7b22636865636b73223a5b7b226e616d65223a22637075222c226f6b223a747275657d2c7b226e616d65223a226d656d6f7279222c226f6b223a747275657d2c7b226e616d65223a2267707530222c226f6b223a747275657d2c7b226e616d65223a2267707531222c226f6b223a747275657d2c7b226e616d65223a2267707532222c226f6b223a747275657d2c7b226e616d65223a2267707533222c226f6b223a747275657d2c7b226e616d65223a2267707534222c226f6b223a747275657d2c7b226e616d65223a2267707535222c226f6b223a747275657d2c7b226e616d65223a2267707536222c226f6b223a747275657d2c7b226e616d65223a2267707537222c226f6b223a747275657d5d2c22647269766572223a2273696d222c226865616c746879223a747275652c22686f73746e616d65223a2273696d2d30227d',1,'admin',1796146108059,1796146108064,1796146708059,'\x0a11636a71776b707578356e346c72646b697712116e34336965706772746e6f636e636c6f751a08646961672e72756e22027b7d289cad9a95a33430dbfcbe95a3343a106a615938563344746e52546636795133','\x157daf82258a2ffe84bb00ee882491691d17246f94eef8347006e41bf71a3daddea4b12481d9c29486b4416e302cc384b6c8d21142b029a775c2fbd0711a9405','\x308201b330820165a003020102021073132aff2e12ab64be119ab9bd085d9c300506032b6570305431153013060355040a130c6465762e62632e6c6f63616c31153013060355040b130c6465762e62632e6c6f63616c312430220603550403131b42657474657220436f6d7075746520636f6d6d616e6420726f6f74301e170d3236313230313137323731315a170d3236313230323137323831315a30243122302006035504031319776f726b657220776b7a3477756c6368636a35776b63357365302a300506032b65700321002e427c90b2b1ffed54e57eec375e469cb017e163fc0268a146c397f26ce7db95a37d307b300e0603551d0f0101ff040403020780300c0603551d130101ff04023000301f0603551d2304183016801413db5b41b7ec0d71e467753bea848d7ed0ad3f43303a0603551d1104333031862f7370696666653a2f2f6465762e62632e6c6f63616c2f776f726b65722f776b7a3477756c6368636a35776b63357365300506032b6570034100c3ea179bc14a4a53adb31d58406814928d6a29cc7b35475d0ec174c2f3d7572f80195de136ca37da64f7be19ef24c6b523fa9fccf2051d933b6b344e1bbcc40f','\x0a11636a71776b707578356e346c72646b697712116e34336965706772746e6f636e636c6f751a0973756363656564656422c2027b22636865636b73223a5b7b226e616d65223a22637075222c226f6b223a747275657d2c7b226e616d65223a226d656d6f7279222c226f6b223a747275657d2c7b226e616d65223a2267707530222c226f6b223a747275657d2c7b226e616d65223a2267707531222c226f6b223a747275657d2c7b226e616d65223a2267707532222c226f6b223a747275657d2c7b226e616d65223a2267707533222c226f6b223a747275657d2c7b226e616d65223a2267707534222c226f6b223a747275657d2c7b226e616d65223a2267707535222c226f6b223a747275657d2c7b226e616d65223a2267707536222c226f6b223a747275657d2c7b226e616d65223a2267707537222c226f6b223a747275657d5d2c22647269766572223a2273696d222c226865616c746879223a747275652c22686f73746e616d65223a2273696d2d30227d309ead9a95a3343a08646961672e72756e422044136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a','\x304602210098aabb15690e9a5a25a5fefa6cf653d260f3c95defeb01644f0fcaba8ecc157602210083296cd63f2cae68e18934ced21ee3cb7b106a068087c30ee684d1965ed49229','c402b3b8b1f30697bf6ea7be2501e745',NULL);
CREATE TABLE audit_events (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL,
  at          BIGINT NOT NULL,
  actor       TEXT NOT NULL,
  action      TEXT NOT NULL,
  resource    TEXT NOT NULL,
  outcome     TEXT NOT NULL,
  request_id  TEXT NOT NULL DEFAULT '',
  caller      TEXT NOT NULL DEFAULT '',
  details     TEXT NOT NULL DEFAULT '{}'
, seq BIGINT);
INSERT INTO audit_events VALUES('ev_vqdu5ub6pixisad3','root',1796146091611,'dev','compute:api-keys:create','api-key/kh3jg4ynwovckdg3b','allowed','','','{"identity":"admin","tenant_id":"root"}',0);
INSERT INTO audit_events VALUES('ev_igfibf5uspkcptsk','root',1796146091613,'dev','compute:join-tokens:create','join-token/jt_wcriz5f7jjo7tr4z','allowed','','','{"expires_at":1796146691613,"role":"node"}',1);
INSERT INTO audit_events VALUES('ev_u2kbty347rbav2f2','root',1796146091622,'node/n43iepgrtnocnclou','compute:nodes:join','node/n43iepgrtnocnclou','allowed','','','{"name":"sim-0","role":"node","token_id":"jt_wcriz5f7jjo7tr4z"}',2);
INSERT INTO audit_events VALUES('ev_kgwulwwzupge3nbp','root',1796146091630,'dev','compute:join-tokens:create','join-token/jt_yunveaout274geyd','allowed','','','{"expires_at":1796146691630,"role":"node"}',3);
INSERT INTO audit_events VALUES('ev_agxsnqqzfe7wf3f2','root',1796146091635,'node/nwvpkwufjw4jj64hq','compute:nodes:join','node/nwvpkwufjw4jj64hq','allowed','','','{"name":"sim-1","role":"node","token_id":"jt_yunveaout274geyd"}',4);
INSERT INTO audit_events VALUES('ev_7uiktag6ding7eik','root',1796146108059,'admin','compute:commands:create','command/cjqwkpux5n4lrdkiw','allowed','req_xjpw6cfxw625jrry','127.0.0.1','{"kind":"diag.run","node_id":"n43iepgrtnocnclou","payload_sha256":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}',5);
INSERT INTO audit_events VALUES('ev_xfv3nipkaes7oh42','root',1796146109408,'admin','compute:tenants:create','tenant/tgurff5k2meuxkmr7','allowed','req_f6nkd5xgppjuij4f','127.0.0.1','{"name":"acme","parent_id":"root"}',6);
INSERT INTO audit_events VALUES('ev_7gy6n7kx55viopmi','root',1796146109425,'admin','compute:batches:create','batch/bvvm5pn2666oibdda','allowed','req_drnpiuhiesxuu2gt','127.0.0.1','{"agent":"","agent_for":"","leaves":1,"root":"7683d158277b34a071e4b11ea516a3218ac7f108eacd5a0c4ffd01eaa8c887d3"}',7);
INSERT INTO audit_events VALUES('ev_fv73bd6ep2x4wyi3','root',1796146109511,'admin','compute:batches:approve','batch/bvvm5pn2666oibdda','allowed','req_s46o4yimeq7hee4s','127.0.0.1','{"approver_key":"Nntj5XagCUTOu9lplFczot6DDiJndfGFHJmis4Xl0FQ=","quorum_reached":false,"root":"7683d158277b34a071e4b11ea516a3218ac7f108eacd5a0c4ffd01eaa8c887d3"}',8);
INSERT INTO audit_events VALUES('ev_53xvkxp3twnezr6l','root',1796146111495,'admin','compute:secrets:manage','secret://root/db-password','allowed','req_dkdis5zywvr7cioh','127.0.0.1','{"op":"put","scope":"tenant","version":1}',9);
CREATE TABLE events (
  id       TEXT PRIMARY KEY,
  at       BIGINT NOT NULL,
  type     TEXT NOT NULL,
  node_id  TEXT NOT NULL DEFAULT '',
  details  TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO events VALUES('se_3a67jwfh27nesdrk',1796146091623,'node.joined','n43iepgrtnocnclou','{"name":"sim-0"}');
INSERT INTO events VALUES('se_tzbhkk2fbkbynqcg',1796146091636,'node.joined','nwvpkwufjw4jj64hq','{"name":"sim-1"}');
CREATE TABLE identities (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  kind        TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);
INSERT INTO identities VALUES('admin','root','admin','person',0);
CREATE TABLE roles (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  statements  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);
INSERT INTO roles VALUES('admin','root','admin','[{"effect":"allow","actions":["*"],"resources":["*"]}]',0);
INSERT INTO roles VALUES('viewer','root','viewer','[{"effect":"allow","actions":["compute:*:get","compute:*:list"],"resources":["*"]}]',0);
INSERT INTO roles VALUES('operator','root','operator','[{"effect":"allow","actions":["compute:*:get","compute:*:list","compute:commands:create","compute:join-tokens:create"],"resources":["*"]}]',0);
CREATE TABLE bindings (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL REFERENCES tenants(id),
  identity_id  TEXT NOT NULL REFERENCES identities(id),
  role_id      TEXT NOT NULL REFERENCES roles(id),
  created_at   BIGINT NOT NULL,
  UNIQUE (tenant_id, identity_id, role_id)
);
INSERT INTO bindings VALUES('admin','root','admin','admin',0);
CREATE TABLE idempotency (
  tenant_id    TEXT NOT NULL,
  identity_id  TEXT NOT NULL,
  key          TEXT NOT NULL,
  method       TEXT NOT NULL,
  body_sha256  BYTEA NOT NULL,
  status       INTEGER NOT NULL,
  response     BYTEA,
  created_at   BIGINT NOT NULL, lease_expires_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, identity_id, key)
);
CREATE TABLE sessions (
  id           TEXT PRIMARY KEY,
  hash         BYTEA NOT NULL UNIQUE,
  tenant_id    TEXT NOT NULL,
  identity_id  TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  expires_at   BIGINT NOT NULL,
  revoked_at   BIGINT
, key_id TEXT, parent_id TEXT);
CREATE TABLE audit_log_state (
  tenant_id   TEXT PRIMARY KEY,
  size        BIGINT NOT NULL,
  compact     BYTEA NOT NULL,
  updated_at  BIGINT NOT NULL
);
INSERT INTO audit_log_state VALUES('root',10,'\x4ee09d13bc649d37f8ec29f682fdca9bab9acc82ab8f4d1e25b782f544a8978e04d9d8e7c245d7bedd26100af72ad099730524223a181e5e9ecdaaff64979515',1796146113031);
CREATE TABLE audit_log_nodes (
  tenant_id  TEXT NOT NULL,
  level      INTEGER NOT NULL,
  idx        BIGINT NOT NULL,
  hash       BYTEA NOT NULL,
  event_id   TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (tenant_id, level, idx)
);
INSERT INTO audit_log_nodes VALUES('root',0,0,'\x59545fa4b87e99ef527f9bbabfd548b4dae0d65c848c67a0016c67b442b12056','ev_vqdu5ub6pixisad3');
INSERT INTO audit_log_nodes VALUES('root',0,1,'\xd6259d0f6814359ce6c06abcc3d54f0f364390f1b266c45f6672d5f6656dda22','ev_igfibf5uspkcptsk');
INSERT INTO audit_log_nodes VALUES('root',1,0,'\xabcde9c64ed66ec8c7f2167d712954852be13960e4bf147406ef7c40940f7671','');
INSERT INTO audit_log_nodes VALUES('root',0,2,'\x53b20c1c55f45072178cb2fceb0896f82aef20c67603bb74fdfbb0ad1071cf1f','ev_u2kbty347rbav2f2');
INSERT INTO audit_log_nodes VALUES('root',0,3,'\x73c8bbb568db9f807d1333d4c52219a579d35a1a35dfc2188083e7d3bb266cd5','ev_kgwulwwzupge3nbp');
INSERT INTO audit_log_nodes VALUES('root',1,1,'\xd95a0dddd203b965d5dc257cf3c571fb9e03de2a6ac40030d907d28135d8b389','');
INSERT INTO audit_log_nodes VALUES('root',2,0,'\x116cbf586236b10605073679f985f362b97ad0e293be36ea72d01566788c9692','');
INSERT INTO audit_log_nodes VALUES('root',0,4,'\x8029450ee098478183a36c5cfec9a97d04f3ea141a562bb41c9a18561da0a375','ev_agxsnqqzfe7wf3f2');
INSERT INTO audit_log_nodes VALUES('root',0,5,'\x570383a92e4561e28cdf793690c128d79c0121e42587f6df5a59fe44a8681e29','ev_7uiktag6ding7eik');
INSERT INTO audit_log_nodes VALUES('root',1,2,'\xfe69d7fe298867fb861ef5dee9b00f3f2e0b080099c601edf3511f00cc99f841','');
INSERT INTO audit_log_nodes VALUES('root',0,6,'\xd2f080cf1c1dd86460acfa4cbaaf0c87a1567576c51dcb5e1998ecf5ca69e4a1','ev_xfv3nipkaes7oh42');
INSERT INTO audit_log_nodes VALUES('root',0,7,'\x3fe113902ba745810eb3f8e77b97a96bd2700e63f84dbde558da04f1e2d4d95a','ev_7gy6n7kx55viopmi');
INSERT INTO audit_log_nodes VALUES('root',1,3,'\x60924f9fa4214236db921f44eb881c8a4ec75f3816e7f81bd1927272dec6e9a7','');
INSERT INTO audit_log_nodes VALUES('root',2,1,'\x318ee1172a75c35d7715a12fa09a6a903d961ef799be78a306b4d4e0bd6d3456','');
INSERT INTO audit_log_nodes VALUES('root',3,0,'\x4ee09d13bc649d37f8ec29f682fdca9bab9acc82ab8f4d1e25b782f544a8978e','');
INSERT INTO audit_log_nodes VALUES('root',0,8,'\x9246734e41776cbe479750837285a19bf852bf943e08589df1f776726eb67d30','ev_fv73bd6ep2x4wyi3');
INSERT INTO audit_log_nodes VALUES('root',0,9,'\x8e7e731e25baf0212b67fa110d670623d979240e682c17181b880a0fc8d2b17d','ev_53xvkxp3twnezr6l');
INSERT INTO audit_log_nodes VALUES('root',1,4,'\x04d9d8e7c245d7bedd26100af72ad099730524223a181e5e9ecdaaff64979515','');
CREATE TABLE audit_checkpoints (
  tenant_id    TEXT NOT NULL,
  size         BIGINT NOT NULL,
  prev_size    BIGINT NOT NULL,
  note         BYTEA NOT NULL,
  consistency  BYTEA NOT NULL,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, size)
);
INSERT INTO audit_checkpoints VALUES('root',10,0,'\x6465762e62632e6c6f63616c2f61756469742f726f6f740a31300a504d707754637034564b4949315a6142454f38597479354f584f6141556a706779346b2f576c4a526f67593d0a0ae28094206465762e62632e6c6f63616c2f617564697420542f6e7561655862447175463441586e3978526541654f366a702f446a6835424838714579526142447930735a782b46313134575439452b5659774966316b446c44584d64534d4c6c7a6b78567a584d776f67323041334f74676b3d0a','\x',1796146113031);
CREATE TABLE audit_sink_cursors (
  sink        TEXT NOT NULL,
  tenant_id   TEXT NOT NULL,
  next_seq    BIGINT NOT NULL,
  updated_at  BIGINT NOT NULL,
  PRIMARY KEY (sink, tenant_id)
);
CREATE TABLE batches (
  id            TEXT PRIMARY KEY,
  tenant_id     TEXT NOT NULL,
  deployment    TEXT NOT NULL,
  root          BYTEA NOT NULL,
  leaf_count    INTEGER NOT NULL,
  state         TEXT NOT NULL,
  proposed_by   TEXT NOT NULL,
  agent         TEXT NOT NULL DEFAULT '',
  agent_for     TEXT NOT NULL DEFAULT '',
  created_at    BIGINT NOT NULL,
  expires_at    BIGINT NOT NULL,
  approved_at   BIGINT
);
INSERT INTO batches VALUES('bvvm5pn2666oibdda','root','dev.bc.local','\x7683d158277b34a071e4b11ea516a3218ac7f108eacd5a0c4ffd01eaa8c887d3',1,'proposed','admin','','',1796146109425,1796149709425,NULL);
CREATE TABLE batch_leaves (
  batch_id       TEXT NOT NULL REFERENCES batches(id),
  idx            INTEGER NOT NULL,
  node_id        TEXT NOT NULL,
  kind           TEXT NOT NULL,
  unbound        INTEGER NOT NULL,
  payload_sha256 BYTEA NOT NULL,
  payload        BYTEA,
  PRIMARY KEY (batch_id, idx)
);
INSERT INTO batch_leaves VALUES('bvvm5pn2666oibdda',0,'n43iepgrtnocnclou','disk.wipe',0,'\x44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a','\x7b7d');
CREATE TABLE batch_approvals (
  batch_id     TEXT NOT NULL REFERENCES batches(id),
  approver_key BYTEA NOT NULL,
  signature    BYTEA NOT NULL,
  submitted_by TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (batch_id, approver_key)
);
INSERT INTO batch_approvals VALUES('bvvm5pn2666oibdda','\x367b63e576a00944cebbd969945733a2de830e226775f1851c99a2b385e5d054','\x8c031c8a5d7fb51c2fe301e0a00b3b8d893a6ac77e3ce273d656e2fb91faf24085ec16d64b9047ab0599733d6c4f46c0194490e34fab3df7b082b523f97d000d','admin',1796146109511);
CREATE TABLE approver_sets (
  generation  BIGINT PRIMARY KEY,
  deployment  TEXT NOT NULL,
  threshold   INTEGER NOT NULL,
  keys        BYTEA NOT NULL,
  signatures  TEXT NOT NULL,
  created_at  BIGINT NOT NULL
);
CREATE TABLE approver_set_signatures (
  generation   BIGINT NOT NULL,
  message      BYTEA NOT NULL,
  approver_key BYTEA NOT NULL,
  signature    BYTEA NOT NULL,
  threshold    INTEGER NOT NULL,
  keys         BYTEA NOT NULL,
  submitted_by TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (generation, message, approver_key)
);
CREATE TABLE secrets (
  ref         TEXT NOT NULL,
  version     INTEGER NOT NULL,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  scope       TEXT NOT NULL,
  sealed      BYTEA NOT NULL,
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  deleted_at  BIGINT,
  PRIMARY KEY (ref, version)
);
INSERT INTO secrets VALUES('secret://root/db-password',1,'root','db-password','tenant','\x01b6ad0852ef26ee6fb245d78c3c25c6a0122bd7e486a429006f069077e04b82cdbcd730c29ddf50fcb74657','admin',1796146111495,NULL);
CREATE TABLE secret_requests (
  request_id  TEXT PRIMARY KEY,
  node_id     TEXT NOT NULL,
  at          BIGINT NOT NULL
);
CREATE TABLE sandbox_images (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  digest      TEXT NOT NULL,
  size_bytes  BIGINT NOT NULL,
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);
CREATE TABLE sandbox_uploads (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  identity_id TEXT NOT NULL,
  next_offset BIGINT NOT NULL,
  created_at  BIGINT NOT NULL,
  done_at     BIGINT
);
CREATE TABLE sandbox_templates (
  id              TEXT PRIMARY KEY,
  tenant_id       TEXT NOT NULL REFERENCES tenants(id),
  name            TEXT NOT NULL,
  image_name      TEXT NOT NULL,
  image_digest    TEXT NOT NULL,
  runtime         TEXT NOT NULL,
  cpu_millis      BIGINT NOT NULL,
  memory_mb       BIGINT NOT NULL,
  pids            BIGINT NOT NULL,
  disk_mb         BIGINT NOT NULL,
  lifetime_ms     BIGINT NOT NULL,
  max_lifetime_ms BIGINT NOT NULL,
  network         TEXT NOT NULL,
  run_as_root     INTEGER NOT NULL DEFAULT 0,
  env             TEXT NOT NULL DEFAULT '{}',
  labels          TEXT NOT NULL DEFAULT '{}',
  warm            INTEGER NOT NULL DEFAULT 0,
  created_by      TEXT NOT NULL,
  created_at      BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);
CREATE TABLE sandboxes (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL REFERENCES tenants(id),
  template_id  TEXT NOT NULL,
  node_id      TEXT NOT NULL,
  runtime      TEXT NOT NULL,
  memory_mb    BIGINT NOT NULL,
  state        TEXT NOT NULL,
  reason       TEXT NOT NULL DEFAULT '',
  claimed      INTEGER NOT NULL DEFAULT 1,
  created_by   TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  updated_at   BIGINT NOT NULL,
  started_at   BIGINT,
  expires_at   BIGINT NOT NULL,
  max_expires_at BIGINT NOT NULL
);
CREATE TABLE tenant_quotas (
  tenant_id          TEXT PRIMARY KEY REFERENCES tenants(id),
  join_tokens        BIGINT,
  sandboxes          BIGINT,
  warm_memory_mb     BIGINT,
  commands_in_flight BIGINT,
  updated_at         BIGINT NOT NULL
);
CREATE TABLE quota_usage (
  tenant_id   TEXT NOT NULL,
  kind        TEXT NOT NULL,
  used        BIGINT NOT NULL,
  counted_at  BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, kind)
);
CREATE TABLE time_statements (
  id          TEXT PRIMARY KEY,
  body        BYTEA NOT NULL,
  signature   BYTEA NOT NULL,
  signer_cert BYTEA NOT NULL,
  time_ms     BIGINT NOT NULL
);
INSERT INTO time_statements VALUES('latest','\x08fac89a95a334121077536f5835693732524a6d6e6d6652481a0c6465762e62632e6c6f63616c','\xe48d11c033533497526386b36ac0653715ad6999a2b1730223aa245e62b48fee28723f5a269181bf4332cf76b31e7e4fcd8c2f801bf47bc65565609af3c0b90d','\x308201b330820165a003020102021073132aff2e12ab64be119ab9bd085d9c300506032b6570305431153013060355040a130c6465762e62632e6c6f63616c31153013060355040b130c6465762e62632e6c6f63616c312430220603550403131b42657474657220436f6d7075746520636f6d6d616e6420726f6f74301e170d3236313230313137323731315a170d3236313230323137323831315a30243122302006035504031319776f726b657220776b7a3477756c6368636a35776b63357365302a300506032b65700321002e427c90b2b1ffed54e57eec375e469cb017e163fc0268a146c397f26ce7db95a37d307b300e0603551d0f0101ff040403020780300c0603551d130101ff04023000301f0603551d2304183016801413db5b41b7ec0d71e467753bea848d7ed0ad3f43303a0603551d1104333031862f7370696666653a2f2f6465762e62632e6c6f63616c2f776f726b65722f776b7a3477756c6368636a35776b63357365300506032b6570034100c3ea179bc14a4a53adb31d58406814928d6a29cc7b35475d0ec174c2f3d7572f80195de136ca37da64f7be19ef24c6b523fa9fccf2051d933b6b344e1bbcc40f',1796146111610);
CREATE INDEX node_certs_node ON node_certs(node_id);
CREATE INDEX node_certs_revoked ON node_certs(revoked_at);
CREATE INDEX session_flips_serial ON session_flips(cert_serial, at);
CREATE INDEX commands_node_state ON commands(node_id, state);
CREATE INDEX commands_state ON commands(state);
CREATE INDEX audit_events_tenant ON audit_events(tenant_id, at);
CREATE INDEX events_type ON events(type, at);
CREATE INDEX bindings_identity ON bindings(identity_id);
CREATE UNIQUE INDEX audit_events_tenant_seq ON audit_events(tenant_id, seq);
CREATE INDEX audit_events_unsealed ON audit_events(tenant_id, at, id) WHERE seq IS NULL;
CREATE INDEX batches_state ON batches(state);
CREATE INDEX secrets_tenant ON secrets(tenant_id, name);
CREATE INDEX sandboxes_tenant ON sandboxes(tenant_id, state);
CREATE INDEX sandboxes_node ON sandboxes(node_id, state);
CREATE INDEX sandboxes_template ON sandboxes(template_id, state);
CREATE INDEX idempotency_created ON idempotency(created_at);
CREATE INDEX sessions_key ON sessions(key_id);
CREATE INDEX sessions_parent ON sessions(parent_id);
CREATE INDEX join_tokens_outstanding ON join_tokens(tenant_id, expires_at) WHERE used_at IS NULL;
CREATE INDEX commands_tenant_state ON commands(tenant_id, state);
CREATE INDEX node_sessions_connected ON node_sessions(connected_at);
CREATE INDEX node_sessions_gateway ON node_sessions(gateway_id, closed_at);
CREATE INDEX session_flips_node ON session_flips(node_id, at);
CREATE INDEX tenants_parent ON tenants(parent_id);
CREATE INDEX api_keys_made_by ON api_keys(made_by);
COMMIT;
