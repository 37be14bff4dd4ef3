"""Campaign report under gunicorn + PostgreSQL for a campaign with 1,000 ratings.

A throwaway database gets a campaign whose ratings are stored through the services (the same
rows the API writes); gunicorn serves it as in production (DEBUG off, a private Redis cache:
`_server.serve`); then, as staff, over HTTP:
  1. the first visit (statistics computed and cached),
  2. `--visits` further visits of the report page and of the report API: p50/p95
     (target: p95 < 300 ms),
  3. one new rating, then the next visit (the cache is invalidated and recomputed).
Prints the machine's CPU count and load average with the figures.

    .venv/bin/python benchmarks/bench_report.py --ratings 1000 --visits 40
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server import machine_load, pct, request, serve  # noqa: E402

SETUP = r"""
import json, random, sys
from django.contrib.auth.models import Group, User
from django.contrib.sessions.backends.db import SessionStore
from rest_framework.authtoken.models import Token
from annotation.services.campaigns import campaign_create
from annotation.services.leases import assignment_next
from annotation.services.ratings import rating_submit
ratings, annotators = int(sys.argv[2]), int(sys.argv[3])
staff = User.objects.create(username="staff", is_staff=True, is_superuser=True)
campaign = campaign_create(user=staff, benchmark="bench", guidelines="g", overlap=annotators)
group = Group.objects.get(name="annotator")
rng = random.Random(0)
users = []
for i in range(annotators):
    user = User.objects.create(username=f"annotator{i}")
    user.groups.add(group)
    users.append(user)
done = 0
while done < ratings:
    user = users[done % annotators]
    lease = assignment_next(user=user, campaign_id=campaign.pk)
    values = {k: rng.randint(1, 5) for k in ("factuality", "relevance", "helpfulness", "personal_rubrics")}
    other = {k: rng.randint(1, 5) for k in values}
    rating_submit(user=user, token=lease.assignment.token, ratings={"1": values, "2": other},
                  seconds=rng.uniform(20, 200))
    done += 1
late = User.objects.create(username="late")
late.groups.add(group)
session = SessionStore()
session["_auth_user_id"] = str(staff.pk)
session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
session["_auth_user_hash"] = staff.get_session_auth_hash()
session.create()
print(json.dumps({"campaign": campaign.pk, "token": Token.objects.create(user=staff).key,
                  "session": session.session_key, "late": Token.objects.create(user=late).key}))
"""


def timed(url: str, headers: dict) -> float:
    t0 = time.perf_counter()
    status, _ = request(url, headers)
    if status != 200:
        sys.exit(f"{url}: HTTP {status}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratings", type=int, default=1000)
    parser.add_argument("--annotators", type=int, default=3)
    parser.add_argument("--visits", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    args = parser.parse_args()
    pairs = args.ratings // args.annotators + 10

    load_before = machine_load()
    with serve(pairs=pairs, workers=args.workers, setup=SETUP,
               setup_args=(str(args.ratings), str(args.annotators))) as (server, setup):
        page = f"{server.base}/annotation/campaigns/{setup['campaign']}/report/"
        api = f"{server.base}/api/annotation/campaigns/{setup['campaign']}/report/"
        cookie = {"Cookie": f"sessionid={setup['session']}"}
        token = {"Authorization": f"Token {setup['token']}"}
        first = timed(page, cookie)
        pages = [timed(page, cookie) for _ in range(args.visits)]
        apis = [timed(api, token) for _ in range(args.visits)]
        late = {"Authorization": f"Token {setup['late']}"}
        _, body = request(f"{server.base}/api/annotation/next/?campaign={setup['campaign']}", late)
        import json

        values = dict.fromkeys(("factuality", "relevance", "helpfulness", "personal_rubrics"), 3)
        request(f"{server.base}/api/annotation/ratings/", late,
                {"assignment": json.loads(body)["assignment"], "ratings": {"1": values, "2": values}})
        after_new = timed(page, cookie)
        again = timed(page, cookie)
    load_after = machine_load()

    print(f"campaign report, {args.ratings} ratings by {args.annotators} annotators on {pairs} pairs; "
          f"gunicorn x{args.workers}, PostgreSQL, loopback; machine: {load_before} before, {load_after} after")
    print(f"first visit (computes and caches the statistics): {first * 1000:.0f} ms")
    for name, values in (("report page", pages), ("report API ", apis)):
        p95 = pct(values, 95)
        print(f"{name} x{len(values)}: p50 {pct(values, 50):.1f} ms  p95 {p95:.1f} ms  "
              f"(target p95 < 300 ms: {'met' if p95 < 300 else 'NOT met'})")
    print(f"after one new rating: first visit {after_new * 1000:.0f} ms (recomputed), next {again * 1000:.0f} ms")


if __name__ == "__main__":
    main()
