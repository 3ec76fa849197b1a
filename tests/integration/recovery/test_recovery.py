"""Crash recovery: kill -9 of the gateway between the intent row and the
provider's answer, restart, and compare the bindings with the sim provider's
own list (external osr-sim, so resources outlive the gateway)."""
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import gwlib  # noqa: E402
import osrtest  # noqa: E402
import services  # noqa: E402

N = 12


def settle(tc, gw, sim, key, timeout=30):
    """Wait until the reaper has had a chance to reconcile, then check: no
    binding left creating, every live binding has exactly its resource, and
    every labelled resource belongs to a live binding (no orphan, no
    duplicate)."""
    def consistent():
        items = gw.list_all(key)
        res = sim.resources()
        live = {s["id"]: s for s in items if s["state"] in ("running", "paused")}
        by_sid = {}
        for r in res:
            by_sid.setdefault(r["sandbox_id"], []).append(r)
        if any(s["state"] == "creating" for s in items):
            return None
        if set(by_sid) != set(live):
            return None
        for sid, rs in by_sid.items():
            if len(rs) != 1 or rs[0]["id"] != live[sid]["binding"]["providerId"]:
                return None
        return items, res
    return gw.wait(consistent, timeout=timeout, what="bindings and osr-sim agree")


class Recovery(unittest.TestCase):
    def run_crash(self, store=None, wait_for_sim=True):
        with gwlib.Sim("--latency-ms", "3000") as sim:
            providers = [{"name": "sim", "type": "sim", "url": sim.url}]
            gw = gwlib.Gateway(providers, store=store, cfg={"reaper": {"interval_ms": 500}})
            try:
                key = gwlib.ADMIN_KEY
                tkey = gw.new_key("acme")
                def create(i):
                    try:
                        gw.create(tkey, {"metadata": {"i": str(i)}}, timeout=10)
                    except OSError:
                        pass  # the gateway is killed under this request
                ts = [threading.Thread(target=create, args=(i,), daemon=True) for i in range(N)]
                for t in ts:
                    t.start()
                # All intents are durable (state creating) and the provider is working.
                gw.wait(lambda: len(gw.list_all(key, "state=creating")) == N, what="%d intents" % N)
                gw.kill9()
                # An orphan planted at the provider while no gateway runs (a
                # live reaper would destroy it while it boots): our label, no
                # binding anywhere.
                st, body = sim.call("POST", "/v1/resources", {"sandbox_id": "orphanaaaaaaaaaaaaaa", "tenant": "acme"})
                self.assertEqual(st, 201, body)
                for t in ts:
                    t.join(15)
                if wait_for_sim:
                    # Let osr-sim finish the creates whose client died: recovery must adopt them.
                    end = time.time() + 15
                    while time.time() < end and len(sim.resources()) < N + 1:
                        time.sleep(0.1)
                    self.assertEqual(len(sim.resources()), N + 1)
                gw.start()
                items, resources = settle(self, gw, sim, key)
                self.assertEqual(len(items), N)
                self.assertNotIn("orphanaaaaaaaaaaaaaa", {r["sandbox_id"] for r in resources})
                audit = gw.req("GET", "/v1/audit?limit=1000", key=key).json["items"]
                actions = [e["action"] for e in audit]
                if wait_for_sim:
                    # every interrupted create was adopted, none failed
                    self.assertEqual(sum(1 for s in items if s["state"] == "running"), N)
                    self.assertEqual(actions.count("recover.adopt"), N)
                    self.assertIn("recover.orphan", actions)
                # the tenant's view agrees with the admin's
                self.assertEqual(len(gw.list_all(tkey)), N)
                # the gateway works normally after recovery
                r = gw.create(tkey, {}, timeout=20)
                self.assertEqual(r.status, 201, r)
            finally:
                gw.close()

    def test_kill9_adopt_sqlite(self):
        self.run_crash()

    def test_kill9_restart_before_provider_answers(self):
        # Restart at once: the provider finishes creating only after
        # recovery marked the rows failed, so the reaper must destroy those
        # late resources as orphans. Either way: no creating, no orphan.
        self.run_crash(wait_for_sim=False)

    def test_kill9_adopt_postgres(self):
        with services.PgServer() as pg:
            self.run_crash(store=pg.url)


class LostUpdate(unittest.TestCase):
    """The create's binding update (creating -> running) commits with
    synchronous_commit = off on PostgreSQL, so a PostgreSQL crash may lose it
    after the client got its 201. Each binding is put back into exactly what
    such a loss leaves (the intent row: creating, no provider id, no endpoint,
    no granted capabilities, updated_ms as at intent, no "create ok" audit
    row) and must come back to running, pointing at its labelled resource:
    by the reaper's stale pass while the gateway keeps running, and by
    recovery at start. Without either path the rows stay creating and the
    waits below time out."""

    STALE_MS = 2000

    def lose_update(self, pg, ids):
        inl = ",".join("'%s'" % i for i in ids)
        pg.psql("UPDATE bindings SET state = 1, provider_id = '', agent_endpoint = '', "
                "granted_json = NULL, updated_ms = created_ms, last_activity_ms = 0 WHERE id IN (%s)" % inl)
        pg.psql("DELETE FROM audit WHERE action = 'create' AND sandbox_id IN (%s)" % inl)

    def check_adopted(self, gw, sim, tkey, made, action):
        key = gwlib.ADMIN_KEY
        ids = set(made)

        def done():
            items = {s["id"]: s for s in gw.list_all(key) if s["id"] in ids}
            return items if all(s["state"] == "running" for s in items.values()) else None
        items = gw.wait(done, timeout=30, what="lost binding updates adopted")
        by_sid = {r["sandbox_id"]: r for r in sim.resources()}
        for sid, s in items.items():
            # The same resource the 201 named, found again by its label.
            self.assertEqual(s["binding"]["providerId"], made[sid]["binding"]["providerId"])
            self.assertEqual(s["binding"]["providerId"], by_sid[sid]["id"])
            # The data plane's side: a token is issued for a running binding again.
            r = gw.req("POST", "/v1/sandboxes/%s/tokens" % sid, {}, key=tkey)
            self.assertEqual(r.status, 201, r)
            self.assertTrue(r.json["token"])
        audit = gw.req("GET", "/v1/audit?limit=1000", key=key).json["items"]
        acts = [e for e in audit if e["sandboxId"] in ids and e["action"] == action]
        self.assertEqual({e["sandboxId"] for e in acts}, ids, audit)
        self.assertTrue(all(e["outcome"] == "ok" for e in acts), acts)

    def create_some(self, gw, tkey, n=4):
        made = {}
        for i in range(n):
            r = gw.create(tkey, {"metadata": {"i": str(i)}}, timeout=20)
            self.assertEqual(r.status, 201, r)
            made[r.json["id"]] = r.json
        return made

    def test_lost_binding_update_adopted_running_and_at_start(self):
        with services.PgServer() as pg, gwlib.Sim("--latency-ms", "0") as sim:
            cfg = {"reaper": {"interval_ms": 300, "stale_creating_ms": self.STALE_MS}}
            gw = gwlib.Gateway([{"name": "sim", "type": "sim", "url": sim.url}], store=pg.url, cfg=cfg)
            try:
                tkey = gw.new_key("acme")
                # 1. While the gateway keeps running: the reaper's stale pass.
                made = self.create_some(gw, tkey)
                self.lose_update(pg, made)
                for sid in made:
                    g = gw.req("GET", "/v1/sandboxes/" + sid, key=tkey)
                    self.assertEqual(g.json["state"], "creating", g)
                    r = gw.req("POST", "/v1/sandboxes/%s/tokens" % sid, {}, key=tkey)
                    self.assertEqual(r.status, 409, r)
                self.check_adopted(gw, sim, tkey, made, "reap.stale_creating")

                # 2. At start: the gateway is gone when the update is lost;
                # its reaper could not take these rows for 10 minutes, so
                # only recovery at start (its own rows, any age) can.
                made = self.create_some(gw, tkey)
                gw.kill9()
                self.lose_update(pg, made)
                with open(gw.cfg_path) as f:
                    conf = json.load(f)
                conf["reaper"]["stale_creating_ms"] = 600000
                with open(gw.cfg_path, "w") as f:
                    json.dump(conf, f)
                gw.start()
                self.check_adopted(gw, sim, tkey, made, "recover.adopt")
                # Nothing left creating, no orphan, no duplicate.
                settle(self, gw, sim, gwlib.ADMIN_KEY)
            finally:
                gw.close()

    def test_binding_commit_sync_option(self):
        # ?binding_commit=sync is accepted (every commit waits for the disk);
        # a bad value stops the gateway with a typed configuration error.
        with services.PgServer() as pg:
            gw = gwlib.Gateway([{"name": "sim", "type": "sim", "latency_ms": 0}],
                               store=pg.url + "?binding_commit=sync")
            try:
                r = gw.create(gw.new_key("acme"), {}, timeout=20)
                self.assertEqual(r.status, 201, r)
            finally:
                gw.close()
            with self.assertRaises(AssertionError):
                gwlib.Gateway([{"name": "sim", "type": "sim", "latency_ms": 0}],
                              store=pg.url + "?binding_commit=maybe").close()


class MultiGateway(unittest.TestCase):
    """Two gateways (instance ids A and B, their own data dirs) on ONE
    PostgreSQL and one external osr-sim. B restarting must not touch the
    creates A is running; once A dies for good, B's reaper resolves A's
    leftovers after reaper.stale_creating_ms."""

    STALE_MS = 4000

    def gateway(self, pg, sim, ident):
        return gwlib.Gateway([{"name": "sim", "type": "sim", "url": sim.url}], store=pg.url,
                             cfg={"instance_id": ident,
                                  "reaper": {"interval_ms": 300,
                                             "stale_creating_ms": self.STALE_MS}})

    def start_creates(self, gw, tkey, n, tag):
        out = {}

        def create(i):
            try:
                out[i] = gw.create(tkey, {"metadata": {"tag": tag, "i": str(i)}}, timeout=30)
            except OSError:
                out[i] = None  # the gateway was killed under this request
        ts = [threading.Thread(target=create, args=(i,), daemon=True) for i in range(n)]
        for t in ts:
            t.start()
        return ts, out

    def creating_of(self, gw, tag):
        return [s for s in gw.list_all(gwlib.ADMIN_KEY, "state=creating&metadata.tag=" + tag)]

    def test_restart_spares_live_peer_then_reaper_takes_dead_peer(self):
        with services.PgServer() as pg, gwlib.Sim("--latency-ms", "3000") as sim:
            a = self.gateway(pg, sim, "gw-a")
            b = self.gateway(pg, sim, "gw-b")
            try:
                key = gwlib.ADMIN_KEY
                tkey = a.new_key("acme")

                # 1. A has creates in flight (intents durable, sim still
                # booting them: 3 s) while B restarts and recovers.
                ts, out = self.start_creates(a, tkey, N, "first")
                a.wait(lambda: len(self.creating_of(a, "first")) == N, what="%d intents of A" % N)
                b.kill9()
                b.start()
                # B's recovery has run once it listens; its reaper keeps
                # running beside A's creates.
                for t in ts:
                    t.join(40)
                self.assertEqual(sorted(out), list(range(N)))
                for i, r in out.items():
                    self.assertIsNotNone(r, i)
                    self.assertEqual(r.status, 201, r)
                items = [s for s in a.list_all(key) if s["metadata"].get("tag") == "first"]
                self.assertEqual(len(items), N)
                self.assertTrue(all(s["state"] == "running" for s in items), items)
                # B touched none of them: no recovery or reaper action on A's rows.
                audit = b.req("GET", "/v1/audit?limit=1000", key=key).json["items"]
                ids = {s["id"] for s in items}
                touched = [e for e in audit if e["sandboxId"] in ids and
                           (e["action"].startswith("recover.") or e["action"].startswith("reap."))]
                self.assertEqual(touched, [])
                res = sim.resources()
                by_sid = {r["sandbox_id"]: r for r in res}
                self.assertEqual(len(res), N)
                for s in items:
                    self.assertEqual(by_sid[s["id"]]["id"], s["binding"]["providerId"])

                # 2. A is killed -9 mid-create and never comes back.
                ts, out = self.start_creates(a, tkey, N, "second")
                a.wait(lambda: len(self.creating_of(a, "second")) == N, what="%d intents of A" % N)
                a.kill9()
                # Right after, B must still leave them alone (not stale yet).
                time.sleep(1.0)
                self.assertEqual(len(self.creating_of(b, "second")), N)
                for t in ts:
                    t.join(40)
                # B's reaper resolves them once stale: nothing creating, no
                # orphan, the sim agrees.
                items, res = settle(self, b, sim, key, timeout=60)
                second = [s for s in items if s["metadata"].get("tag") == "second"]
                self.assertEqual(len(second), N)
                audit = b.req("GET", "/v1/audit?limit=1000", key=key).json["items"]
                stale = [e for e in audit if e["action"] == "reap.stale_creating"]
                self.assertEqual({e["sandboxId"] for e in stale}, {s["id"] for s in second})
                self.assertTrue(all(e["outcome"] == "ok" for e in stale), stale)
                # Each one was adopted (sim finished it) or failed (it had not
                # started), never left pending.
                self.assertTrue(all(s["state"] in ("running", "failed") for s in second), second)
                # B keeps working.
                r = b.create(tkey, {}, timeout=20)
                self.assertEqual(r.status, 201, r)
            finally:
                try:
                    a.close()
                finally:
                    b.close()


if __name__ == "__main__":
    osrtest.run()
