"""Staff-configured LLM endpoints from the command line (for operators who run vLLM or SGLang
next to the workers and never open the admin). The only addresses model work may call."""

import json

from django.core.management.base import BaseCommand, CommandError

from pipeline.endpoints import EndpointError, endpoint_add, endpoint_remove
from pipeline.models import LLMEndpoint


class Command(BaseCommand):
    help = "Add, list or remove the OpenAI-compatible endpoints judges, generators and planners may call."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="Configure an endpoint.")
        add.add_argument("name")
        add.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8001/v1")
        add.add_argument("--api-key-env", default="",
                         help="Name of the environment variable holding the key on the workers (never the key).")
        add.add_argument("--max-concurrency", type=int, default=4)
        add.add_argument("--timeout", type=int, default=120, help="Seconds one HTTP attempt may take.")
        add.add_argument("--max-retries", type=int, default=4)
        add.add_argument("--deadline", type=int, default=0,
                         help="Seconds one request may take with all its retries and waits (default 0: twice "
                              "--timeout); bounds a job's wait on each wave of requests to a hanging endpoint.")
        add.add_argument("--price-prompt-per-1k", default="0", help="Price per 1,000 prompt tokens.")
        add.add_argument("--price-completion-per-1k", default="0", help="Price per 1,000 completion tokens.")
        add.add_argument("--response-format", choices=("json_schema", "json_object", "none"), default="json_schema",
                         help="How the server takes requests for JSON answers (default json_schema; set to none "
                              "automatically when the server refuses it).")
        add.add_argument("--token-parameter", choices=("max_tokens", "max_completion_tokens"), default="max_tokens",
                         help="The name the server takes for the token budget (hosted reasoning models want "
                              "max_completion_tokens; switched automatically after a 400 naming it).")
        add.add_argument("--no-temperature", action="store_true",
                         help="Never send temperature (models that accept only the default, 1).")
        add.add_argument("--no-seed", action="store_true", help="Never send seed (servers that refuse it).")
        add.add_argument("--no-n", action="store_true", help="Ask N answers as N requests (servers that refuse n).")
        add.add_argument("--reasoning-effort", choices=("minimal", "low", "medium", "high"), default="",
                         help="Send reasoning_effort to a reasoning model (default: not sent).")
        add.add_argument("--model", action="append", default=[], dest="models",
                         help="A model name researchers may choose at this endpoint (repeatable; none given: any "
                              "name). Set it for a hosted API, whose key bills every model it knows.")
        for scope, who in (("run", "one run"), ("day", "one researcher's runs per UTC day")):
            add.add_argument(f"--max-requests-per-{scope}", type=int, default=None,
                             help=f"Spend cap: requests {who} may send (default: none).")
            add.add_argument(f"--max-tokens-per-{scope}", type=int, default=None,
                             help=f"Spend cap: prompt plus completion tokens {who} may use.")
            add.add_argument(f"--max-cost-per-{scope}", default=None, help=f"Spend cap: what {who} may cost.")
        add.add_argument("--replace", action="store_true", help="Update an existing endpoint of that name.")
        listing = sub.add_parser("list", help="List configured endpoints.")
        listing.add_argument("--format", choices=("text", "json"), default="text")
        remove = sub.add_parser("remove", help="Remove an endpoint (disabled instead when results use it).")
        remove.add_argument("name")

    def handle(self, *args, **o):
        try:
            if o["action"] == "add":
                endpoint = endpoint_add(
                    name=o["name"], base_url=o["base_url"], api_key_env=o["api_key_env"],
                    max_concurrency=o["max_concurrency"], timeout_seconds=o["timeout"],
                    max_retries=o["max_retries"], deadline_seconds=o["deadline"], price_prompt_per_1k=o["price_prompt_per_1k"],
                    price_completion_per_1k=o["price_completion_per_1k"], response_format=o["response_format"],
                    token_parameter=o["token_parameter"], accepts_temperature=not o["no_temperature"],
                    accepts_seed=not o["no_seed"], accepts_n=not o["no_n"], reasoning_effort=o["reasoning_effort"],
                    allowed_models=o["models"], replace=o["replace"],
                    caps={f"max_{m}_per_{scope}": o[f"max_{m}_per_{scope}"] for m in ("requests", "tokens", "cost")
                          for scope in ("run", "day")})
                self.stdout.write(f"endpoint '{endpoint.name}' -> {endpoint.base_url}")
            elif o["action"] == "remove":
                endpoint_remove(name=o["name"])
                self.stdout.write(f"removed endpoint '{o['name']}'")
            else:
                self._list(o["format"])
        except EndpointError as exc:
            raise CommandError(str(exc)) from None

    def _list(self, fmt: str) -> None:
        rows = [{"name": e.name, "base_url": e.base_url, "api_key_env": e.api_key_env,
                 "max_concurrency": e.max_concurrency, "timeout": e.timeout_seconds, "max_retries": e.max_retries,
                 "deadline": e.deadline_seconds or 2 * e.timeout_seconds,
                 "price_prompt_per_1k": str(e.price_prompt_per_1k),
                 "price_completion_per_1k": str(e.price_completion_per_1k), "response_format": e.response_format,
                 "token_parameter": e.token_parameter, "accepts_temperature": e.accepts_temperature,
                 "accepts_seed": e.accepts_seed, "accepts_n": e.accepts_n, "reasoning_effort": e.reasoning_effort,
                 "allowed_models": list(e.allowed_models or []), "enabled": e.enabled,
                 **{f"max_{m}_per_{scope}": None if getattr(e, f"max_{m}_per_{scope}") is None
                    else str(getattr(e, f"max_{m}_per_{scope}")) if m == "cost" else getattr(e, f"max_{m}_per_{scope}")
                    for m in ("requests", "tokens", "cost") for scope in ("run", "day")}}
                for e in LLMEndpoint.objects.order_by("name")]
        if fmt == "json":
            self.stdout.write(json.dumps(rows))
            return
        if not rows:
            self.stdout.write("No endpoints. Add one: manage.py llm_endpoint add NAME --base-url URL")
            return
        for r in rows:
            key = f" key=${r['api_key_env']}" if r["api_key_env"] else ""
            state = "" if r["enabled"] else " (disabled)"
            refused = [name for name, flag in (("temperature", "accepts_temperature"), ("seed", "accepts_seed"),
                                               ("n", "accepts_n")) if not r[flag]]
            takes = (f" tokens={r['token_parameter']}" + (f" not-sent={','.join(refused)}" if refused else "")
                     + (f" reasoning_effort={r['reasoning_effort']}" if r["reasoning_effort"] else "")
                     + (f" models={','.join(r['allowed_models'])}" if r["allowed_models"] else ""))
            self.stdout.write(f"{r['name']}\t{r['base_url']}{key} concurrency={r['max_concurrency']} "
                              f"timeout={r['timeout']}s retries={r['max_retries']} deadline={r['deadline']}s"
                              f"{takes}{state}")
