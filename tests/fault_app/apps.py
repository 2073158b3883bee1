from django.apps import AppConfig


class FaultAppConfig(AppConfig):
    name = "tests.fault_app"
    label = "fault_app"
    verbose_name = "Follower fault tests"
