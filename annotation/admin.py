from django.contrib import admin

from .models import Assignment, Campaign, CampaignPair, Rating


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ("name", "benchmark", "overlap", "is_open", "created_at")
    list_filter = ("is_open", "benchmark")
    readonly_fields = ("created_by", "created_at")


@admin.register(CampaignPair)
class CampaignPairAdmin(admin.ModelAdmin):
    list_display = ("campaign", "item", "taken", "is_gold", "domain_index", "stratum_round")
    list_filter = ("campaign", "is_gold")
    list_select_related = ("campaign", "item")
    readonly_fields = ("campaign", "item", "taken", "domain_index", "stratum_round")


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ("pair", "annotator", "status", "chosen_first", "expires_at", "flagged")
    list_filter = ("status", "flagged")
    list_select_related = ("pair__campaign", "annotator")
    readonly_fields = ("token", "campaign", "pair", "annotator", "chosen_first", "leased_at")


@admin.register(Rating)
class RatingAdmin(admin.ModelAdmin):
    list_display = ("campaign", "item", "annotator", "seconds", "created_at")
    list_filter = ("campaign",)
    list_select_related = ("campaign", "item", "annotator")
    readonly_fields = ("assignment", "campaign", "item", "annotator", "chosen", "rejected", "seconds", "created_at",
                       "revised_at")
