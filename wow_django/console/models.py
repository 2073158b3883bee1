"""The console's permissions (an unmanaged placeholder model) and its audit trail."""

from django.db import models

#: codename → what it lets a staff user do in the console (``wow_django.<codename>``).
PERMISSIONS = {
    "view_bus_events": "Can view bus events, traces and failures in the console",
    "view_payloads": "Can view bus event payloads in the console",
    "repush_bus_events": "Can re-push bus events from the console",
    "manage_topic_consumers": "Can manage topic consumers from the console",
    "manage_followers": "Can view and manage followers from the console",
    "view_aggregates": "Can view event streams and snapshots in the console",
    "view_console_audit": "Can view the console's audit trail",
}


class Console(models.Model):
    """No table: the admin index entry of the console and its real permissions."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = list(PERMISSIONS.items())
        verbose_name = "console"
        verbose_name_plural = "console"

    def __str__(self) -> str:
        return "console"


class ConsoleAudit(models.Model):
    """One action taken in the console: who, when, what, on which target, and what came of it."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    # The user's primary key as text, not a foreign key: the table may live on another database than auth's.
    user_pk = models.CharField(max_length=64, blank=True)
    username = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=500, db_index=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "wow_console_audit"
        ordering = ["-at", "-id"]
        default_permissions = ()
        verbose_name = "console audit entry"
        verbose_name_plural = "console audit"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username} {self.action} {self.target}"


class FailureNote(models.Model):
    """Triage of one consumer's failure of one bus event: acknowledged or not, by whom, and a note."""

    event_id = models.CharField(max_length=128)
    consumer_id = models.CharField(max_length=100)
    acknowledged = models.BooleanField(default=False)
    note = models.TextField(blank=True, max_length=2000)
    by = models.CharField(max_length=150)
    at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "wow_console_failure_note"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["event_id", "consumer_id"],
                                               name="wow_console_failure_note_unique")]
        verbose_name = "failure note"

    def __str__(self) -> str:
        return f"{self.event_id} {self.consumer_id}: {'acknowledged' if self.acknowledged else 'open'}"
