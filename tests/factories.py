import factory
from django.contrib.auth.models import Group, User

from pipeline.models import Benchmark, BenchmarkItem, Domain

PASSWORD = "correct-horse-battery-staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def roles(self, create, extracted, **kwargs):
        for role in extracted or ():
            self.groups.add(Group.objects.get_or_create(name=role)[0])
        if create:
            self.save()


class BenchmarkFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Benchmark

    name = factory.Sequence(lambda n: f"bench-{n}")
    content_hash = factory.Sequence(lambda n: f"{n:064x}")
    metadata = factory.LazyFunction(lambda: {"synthetic": True})


class BenchmarkItemFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = BenchmarkItem

    benchmark = factory.SubFactory(BenchmarkFactory)
    position = factory.Sequence(int)
    source_id = factory.Sequence(lambda n: f"item-{n}")
    domain = Domain.ARTS
    category = "Art_and_Entertainment"
    question = factory.Sequence(lambda n: f"Question number {n}: how should I start?")
    profile = factory.LazyFunction(lambda: [
        {"id": f"p{i}", "text": f"Past post {i} about my hobbies.", "category": "Art_and_Entertainment"}
        for i in range(3)
    ])
    narrative = "The user wants concrete, budget-aware advice."
    rubric_aspects = factory.LazyFunction(lambda: [
        {"aspect": "Budget-aware", "evidence": "mentions a tight budget", "reason": "money is a constraint"},
    ])
    chosen = "An answer that respects the budget."
    rejected = "An answer that ignores the budget."
