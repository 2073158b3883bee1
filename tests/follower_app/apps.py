from django.apps import AppConfig


class FollowerAppConfig(AppConfig):
    name = "tests.follower_app"
    label = "follower_app"
    verbose_name = "Follower kill test"
